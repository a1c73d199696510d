"""The reclaim layer of `kubectl pilotfish why`: a batch pod waiting for reclaimed capacity.

A batch pod the webhook moved onto `batch.pilotfish.io/cpu` and `/memory` fits only where
the reclaim controller measured production leaves capacity unused; kube-scheduler then says
"Insufficient batch.pilotfish.io/cpu", which reads like a missing device. This layer says
what it is instead, with amounts: what the pod asks (and asked before translation, from the
`batch.pilotfish.io/original-resources` annotation), the most any node offers free
(batch allocatable minus what batch pods bound there request) and where, and which nodes'
figures are not measured right now (their batch allocatable decays toward 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, TextIO

from pilotfish import names, quantity
from pilotfish.kube.rest import NODES, PODS, ApiError, Rest

BATCH: Final = (names.BATCH_CPU, names.BATCH_MEMORY)
# kube-scheduler's "Insufficient batch.pilotfish.io/cpu" and the extender's "... free in
# batch.pilotfish.io/cpu" / "has 1 batch.pilotfish.io/cpu free".
_SHORT: Final = re.compile(
    r"Insufficient (batch\.pilotfish\.io/(?:cpu|memory))"
    r"|free in (batch\.pilotfish\.io/(?:cpu|memory))"
    r"|(batch\.pilotfish\.io/(?:cpu|memory)) free"
)
BOUND_PODS: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
MAX_STALE_SHOWN: Final = 5


def short_of(messages: Sequence[str]) -> list[str]:
    """The batch resources the scheduler (or the extender) found short, in name order."""
    found = {g for m in messages for match in _SHORT.finditer(m) for g in match.groups() if g}
    return sorted(found)


def amount(resource: str, value: int) -> str:
    """Millicores as cores ("1.5 cores"), bytes in binary SI ("2Gi")."""
    if resource == names.BATCH_CPU:
        whole, milli = divmod(value, 1000)
        cores = f"{whole}.{milli:03d}".rstrip("0") if milli else str(whole)
        return f"{cores} core" if cores == "1" else f"{cores} cores"
    return quantity.canonical(value, quantity.format_for("memory"))


def batch_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's batch.pilotfish.io/* requests: containers summed, init containers' peak."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            requests = (c.get("resources") or {}).get("requests") or {}
            for r in BATCH:
                try:
                    value = quantity.whole(requests[r]) if r in requests else 0
                except quantity.QuantityError:
                    continue
                before = total.get(r, 0)
                total[r] = before + value if key == "containers" else max(before, value)
    return {r: v for r, v in total.items() if v}


def original_text(pod: Mapping[str, Any]) -> str | None:
    """The requests the pod asked for before translation, from the webhook's annotation."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        names.ANNOTATION_ORIGINAL_RESOURCES
    )
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return f"its {names.ANNOTATION_ORIGINAL_RESOURCES} annotation is not JSON"
    parts = []
    for key, kind in (("containers", "container"), ("initContainers", "init container")):
        for name, entries in sorted(((record or {}).get(key) or {}).items()):
            asked = ", ".join(
                f"{r} {v}" for r, v in sorted(((entries or {}).get("requests") or {}).items())
            )
            limits = ", ".join(
                f"{r} {v}" for r, v in sorted(((entries or {}).get("limits") or {}).items())
            )
            text = f"{kind} {name} requests {asked or 'nothing'}"
            parts.append(text + (f" (limits {limits})" if limits else ""))
    return "; ".join(parts) if parts else None


def _reclaim_state(node: Mapping[str, Any]) -> str | None:
    """Why the node's batch figure is not measured now, or None when it is (or unknown)."""
    meta = node.get("metadata") or {}
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == names.CONDITION_BATCH_CAPACITY and cond.get("status") == "False":
            message = str(cond.get("message") or "").strip()
            reason = cond.get("reason") or "Unknown"
            return f"{names.CONDITION_BATCH_CAPACITY} False, {reason}" + (
                f": {message}" if message else ""
            )
    raw = (meta.get("annotations") or {}).get(names.ANNOTATION_RECLAIM)
    try:
        state = (json.loads(raw) or {}).get("state") if raw else None
    except (ValueError, AttributeError):
        state = None
    if state and state != "Measured":
        return f"{names.ANNOTATION_RECLAIM} state {state}: decaying toward 0"
    return None


def reclaim_sentences(
    pod: Mapping[str, Any],
    short: Sequence[str],
    nodes: Sequence[Mapping[str, Any]],
    bound: Sequence[Mapping[str, Any]],
) -> list[str]:
    """The reclaim layer for a pod the scheduler found short of `short` (pure)."""
    if not short:
        return []
    asks = batch_requests(pod)
    allocated: dict[str, dict[str, int]] = {}
    for p in bound:
        node = str((p.get("spec") or {}).get("nodeName") or "")
        if (p.get("metadata") or {}).get("uid") == (pod.get("metadata") or {}).get("uid"):
            continue
        for r, v in batch_requests(p).items():
            per = allocated.setdefault(node, {})
            per[r] = per.get(r, 0) + v
    ask_text = ", ".join(f"{r} {amount(r, asks[r])}" for r in BATCH if r in asks)
    lines = [
        "It waits for reclaimed batch capacity (capacity production reserved but does not "
        f"use, measured by Pilotfish's reclaim controller): it asks {ask_text or 'nothing'}."
    ]
    original = original_text(pod)
    if original:
        lines.append(f"Before it was moved onto reclaimed capacity it asked: {original}.")
    for r in short:
        offers: list[tuple[int, str, int, int]] = []  # (-free, node, allocatable, allocated)
        for n in nodes:
            name = str((n.get("metadata") or {}).get("name") or "")
            raw = ((n.get("status") or {}).get("allocatable") or {}).get(r)
            try:
                alloc = quantity.whole(raw) if raw is not None else None
            except quantity.QuantityError:
                alloc = None
            if alloc is not None:
                used = allocated.get(name, {}).get(r, 0)
                offers.append((-max(alloc - used, 0), name, alloc, used))
        need = amount(r, asks.get(r, 0))
        if not offers:
            lines.append(
                f"No node offers {r} yet: the reclaim controller has measured none (it needs "
                f"Prometheus, PILOTFISH_PROMETHEUS_URL); the pod asks {need}."
            )
            continue
        minus_free, name, alloc, used = min(offers)  # the most free, ties by name
        free = -minus_free
        lines.append(
            f"{r}: the pod asks {need}; the most any node offers free is {amount(r, free)} on "
            f"node {name} (batch allocatable {amount(r, alloc)}, {amount(r, used)} allocated "
            "to batch pods)."
        )
    stale = [
        (str((n.get("metadata") or {}).get("name") or ""), why)
        for n in nodes
        if (why := _reclaim_state(n)) is not None
    ]
    for name, why in sorted(stale)[:MAX_STALE_SHOWN]:
        lines.append(f"Node {name}'s batch figure is not measured now ({why}).")
    if len(stale) > MAX_STALE_SHOWN:
        lines.append(f"And {len(stale) - MAX_STALE_SHOWN} more nodes are not measured now.")
    return lines


def scheduler_messages(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the scheduler last said of an unbound, ungated pod: its PodScheduled message,
    else its FailedScheduling events (none for a bound or gated pod: not its business)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or spec.get("schedulingGates"):
        return []
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return [str(cond.get("message") or "")]
    return [
        str(e.get("message") or e.get("note") or "")
        for e in events
        if e.get("reason") == "FailedScheduling"
    ]


async def reclaim_layer(
    rest: Rest, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], err: TextIO
) -> list[str]:
    """Reads the nodes and the bound pods (a tenant may not: then it says so) for a pod the
    scheduler found short of batch capacity; [] for every other pod."""
    short = short_of(scheduler_messages(pod, events))
    if not short:
        return []
    try:
        nodes, _ = await rest.list_pages(NODES.path())
        bound, _ = await rest.list_pages(PODS.path(), {"fieldSelector": BOUND_PODS})
    except ApiError as e:
        print(f"warning: cannot read nodes and pods for batch capacity ({e.status})", file=err)
        asks = batch_requests(pod)
        text = ", ".join(f"{r} {amount(r, asks[r])}" for r in BATCH if r in asks)
        return [f"It waits for reclaimed batch capacity: it asks {text or 'nothing'}."]
    return reclaim_sentences(pod, short, nodes, bound)
