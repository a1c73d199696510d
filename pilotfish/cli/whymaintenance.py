"""`kubectl pilotfish why nm/NAME`: how far a NodeMaintenance is and what holds each node.

A drain that waits is never a mystery to the controller: every pod it did not evict this
round is recorded in the status as a blocker with a reason, and the budget when one is the
cause. People still have to know what each reason asks of them: a budget of 0 is the
service owner's to raise, a surge waits on the scheduler finding room elsewhere, local
storage needs an explicit opt-in on the maintenance, a batch task only needs time. So each
blocker is said as a sentence naming the pod, the budget and who can unblock it, from the
status alone (read defensively: the controller may not have written every field yet).

`explain_maintenance` is pure (object, now) -> sentences; `run_maintenance` reads and prints.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from typing import Any, Final, TextIO

from pilotfish.api.nodemaintenance import BLOCKED, COMPLETE
from pilotfish.cli.output import ago, human_duration
from pilotfish.kube.rest import NODEMAINTENANCES, ApiError, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock
from pilotfish.timeutil import parse_time_or_none as _time

MAINTENANCE_KINDS: Final = frozenset(
    {"nm", "nms", "nodemaintenance", "nodemaintenances", "nodemaintenance.pilotfish.io"}
)

# What each blocker reason means and who can end it.
REASON_SENTENCES: Final = {
    "DisruptionBudget": "its PodDisruptionBudget {budget} allows no disruption now; it is "
    "evicted once the budget allows one (more of the service's pods Ready, or the budget "
    "raised by its owner)",
    "WaitingForSurge": "its ServiceWorkload may lose no Ready replica, so a replacement must "
    "be Ready on another node first; the ServiceWorkload controller has started it, and the "
    "scheduler must find it room",
    "BatchTaskRunning": "it is a running BatchWorkload task, left to finish until "
    "batchTaskDeadlineSeconds ({deadline}s) after the node began draining, then evicted and "
    "recreated elsewhere without counting as a failure",
    "LocalStorage": "it has an emptyDir volume whose data an eviction loses; set "
    "spec.allowLocalStorage: true on the NodeMaintenance to evict it anyway",
    "EvictionRefused": "the API server refused its last eviction (429){by_budget}; retried "
    "with backoff",
    "Terminating": "it was evicted and is still stopping (its termination grace period)",
}


def maintenance_name(target: str) -> str | None:
    """NAME of `nm/NAME` (or `nodemaintenance/NAME`, ...); None for a target of another kind."""
    kind, sep, name = target.partition("/")
    if sep and name and "/" not in name and kind.lower() in MAINTENANCE_KINDS:
        return name
    return None


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def blocker_sentence(blocker: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    pod = blocker.get("pod") or "a pod"
    reason = str(blocker.get("reason") or "Unknown")
    budget = blocker.get("budget")
    template = REASON_SENTENCES.get(reason)
    if template is None:
        sentence = f"Pod {pod} waits ({reason})"
    else:
        sentence = f"Pod {pod} waits ({reason}): " + template.format(
            budget=budget or "(unknown)",
            deadline=_int(spec.get("batchTaskDeadlineSeconds"), 600),
            by_budget=f" because of budget {budget}" if budget else "",
        )
    message = str(blocker.get("message") or "").strip()
    return f"{sentence} ({message.rstrip('.')})." if message else f"{sentence}."


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def node_lines(node: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    name, state = node.get("name"), node.get("state") or "Pending"
    left = _int(node.get("podsLeft"), 0)
    head = f"Node {name}: {state}"
    if state == "Drained":
        head += ": no pod left to evict"
    elif state == "Failed":
        head += ": it cannot be drained"
    elif state in ("Cordoned", "Draining"):
        head += f", {left} pod{'s' if left != 1 else ''} left"
    elif state == "Pending":
        head += ": waits its turn"
    if node.get("message"):
        head += f" ({node['message']})"
    lines = [head + "."]
    lines += [f"  {blocker_sentence(b, spec)}" for b in node.get("blockers") or []]
    return lines


def explain_maintenance(nm: Mapping[str, Any], now: datetime.datetime) -> list[str]:
    meta = nm.get("metadata") or {}
    spec = nm.get("spec") or {}
    status = nm.get("status") or {}
    name = meta.get("name")
    wanted = [str(n) for n in spec.get("nodes") or []]
    head = f"NodeMaintenance {name}, created {ago(_time(meta.get('creationTimestamp')), now)}"
    if spec.get("reason"):
        head += f" ({spec['reason']})"
    limits = f"at most {_int(spec.get('maxConcurrent'), 1)} node(s) at a time"
    if spec.get("onePerZone"):
        limits += ", one per zone"
    order = spec.get("order") or "Given"
    lines = [f"{head}: {len(wanted)} node(s), {limits}, order {order}."]
    if meta.get("deletionTimestamp"):
        lines.append("It is being deleted: the nodes it cordoned are uncordoned, then it is gone.")
    if not status:
        lines.append(
            "The maintenance controller has not reported on it yet (if this lasts, check "
            "that the Pilotfish operator is running)."
        )
        return lines
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    phase = status.get("phase") or "Pending"
    line = f"Phase {phase}: {status.get('progress') or f'0/{len(wanted)}'} nodes drained"
    if generation is not None and observed is not None and observed < generation:
        line += " (reported for an earlier version of the spec; the controller catches up)"
    lines.append(line + ".")
    blocked = _condition(status, BLOCKED)
    if blocked is not None and blocked.get("status") == "True":
        since = _time(blocked.get("lastTransitionTime"))
        after = _int(spec.get("blockedAfterSeconds"), 300)
        held = f" since {ago(since, now)}" if since else ""
        lines.append(
            f"Blocked{held} (a node held longer than {human_duration(after)}): "
            f"{blocked.get('message') or 'no message'}."
        )
    complete = _condition(status, COMPLETE)
    if complete is not None and complete.get("status") == "True":
        lines.append("Complete: every node is drained; they stay cordoned until it is deleted.")
    reported = {str(n.get("name")): n for n in status.get("nodes") or [] if isinstance(n, Mapping)}
    for n in wanted:
        lines += node_lines(reported.get(n) or {"name": n, "state": "Pending"}, spec)
    return lines


async def run_maintenance(
    rest: Rest,
    name: str,
    clock: Clock = SYSTEM_CLOCK,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    try:
        nm = await rest.get(NODEMAINTENANCES.path(name=name))
    except ApiError as e:
        print(f"error: cannot read NodeMaintenance {name}: {e.message}", file=err)
        return 1
    for line in explain_maintenance(nm, clock.now()):
        print(line, file=out)
    return 0
